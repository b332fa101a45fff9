"""OpenLineage names of jobs and datasets, by the naming spec (stdlib only).

https://openlineage.io/docs/spec/naming: a dataset is ``(namespace, name)``;
the namespace is the data source (``scheme://authority``), the name what is
unique within it: an object key for S3, GCS and Azure (``s3://bucket`` and
``fx/eur.json``), the absolute path for local files (namespace ``file``) and
HDFS, ``database.schema.table`` for databases. A path recorded relative stays
as recorded (the ledger does not know the worker's folder).
"""

from __future__ import annotations

from dataclasses import dataclass

from ledgerflow.views import TaskRow

#: Object stores: the namespace is ``scheme://bucket``, the name the object key (no
#: leading slash); ``gcs`` is written ``gs``, ``s3a``/``s3n`` are ``s3`` (the same objects).
OBJECT_STORES = {"s3": "s3", "s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs",
                 "abfs": "abfs", "abfss": "abfss", "wasb": "wasb", "wasbs": "wasbs",
                 "az": "az", "oss": "oss", "r2": "r2"}
#: File systems: the name is the absolute path (leading slash kept).
FILE_SYSTEMS = frozenset({"hdfs", "webhdfs", "dbfs"})
_LOCAL_HOSTS = frozenset({"", "localhost"})


def dataset_of(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of an artifact URI, by the OpenLineage naming spec.

    Examples:
        >>> dataset_of("s3://fx/rates/eur.json")
        ('s3://fx', 'rates/eur.json')
        >>> dataset_of("/data/in.csv")
        ('file', '/data/in.csv')
        >>> dataset_of("file://nas/share/a.csv")
        ('file://nas', '/share/a.csv')
        >>> dataset_of("postgres://db:5432/shop.public.orders")
        ('postgres://db:5432', 'shop.public.orders')
    """
    if "://" in uri:
        scheme, rest = uri.split("://", 1)
        scheme = scheme.lower()
        authority, _, path = rest.partition("/")
        if scheme == "file":        # file:///p and file://localhost/p are local files
            return ("file" if authority in _LOCAL_HOSTS else f"file://{authority}",
                    "/" + path)
        if scheme in FILE_SYSTEMS:
            return f"{scheme}://{authority}", "/" + path
        scheme = OBJECT_STORES.get(scheme, scheme)
        # object keys and database names (db.schema.table) have no leading slash
        return f"{scheme}://{authority}", path.lstrip("/") or "/"
    if uri.startswith("/") or ":" not in uri:
        return "file", uri
    scheme, rest = uri.split(":", 1)
    return scheme, rest


@dataclass(slots=True)
class Namer:
    """Names of jobs and datasets of one run."""

    namespace: str
    pipeline: str

    def result(self, key: str) -> str:
        return f"{self.pipeline}/{key}"

    def job(self, info: TaskRow) -> str:
        return f"{self.pipeline}.{info.node or info.key}"

