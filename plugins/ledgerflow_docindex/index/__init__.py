"""The doc index file as a package: one module per concept, re-exported by ``store``.

* :mod:`.errors`: ``DocIndexError`` and its kinds;
* :mod:`.locks`: the file locks between processes and their timeout;
* :mod:`.handle`: one open file shared by the threads of a process, lock and
  conflict retries, :func:`~.handle.connect` and :func:`~.handle.transaction`;
* :mod:`.schema`: the tables, ``meta``, upgrades and ``open_index``;
* :mod:`.write`: document writes, postings, deletes and the bulk writer;
* :mod:`.prune`: removing deleted or changed documents;
* :mod:`.embedcache`: the SQLite chunk-level embedding cache;
* :mod:`.explain`: digests, ``index_info`` and ``explain``.

Import the public names from :mod:`ledgerflow_docindex.store` (recipes,
notebooks and scripts do); the modules here import each other, never the façade.
"""
