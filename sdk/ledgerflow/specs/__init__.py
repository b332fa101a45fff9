"""Declarative pipelines: spec files, their one check, policies and machine-written drafts.

A spec is a JSON or TOML file listing steps by task import path. The wing,
one concept a module (nothing is imported here, so loading a ``.py``
pipeline does not pay for it):

* :mod:`~ledgerflow.specs.document` -- reading a spec file (``load_spec``);
* :mod:`~ledgerflow.specs.pipeline` -- ``SpecPipeline``, the graph a spec describes;
* :mod:`~ledgerflow.specs.check` -- every problem of a spec, with its path;
* :mod:`~ledgerflow.specs.touches` -- the paths steps touch, and races between them;
* :mod:`~ledgerflow.specs.problems` -- one problem: path, code, message, hint;
* :mod:`~ledgerflow.specs.catalogue` -- the tasks a spec can name, and their signatures;
* :mod:`~ledgerflow.specs.hints` -- type hints as JSON Schema, and what fits them;
* :mod:`~ledgerflow.specs.schema` -- the JSON Schema of a spec over a catalogue;
* :mod:`~ledgerflow.specs.policy` -- what a spec may use (tasks, paths, network, ...);
* :mod:`~ledgerflow.specs.drafts` -- machine-written specs: header, digest, approval;
* :mod:`~ledgerflow.specs.modules` -- importing a Python file by path.
"""
