"""Where checkpoints go (docs/RL.md section 6): one small key -> bytes interface with two
implementations, so checkpoint.py is written once for a shared filesystem and for S3.

- :class:`DirectoryStore` (the default): keys are relative paths under a root directory. A put
  writes a temporary file beside the target, fsyncs it, renames it over the target and fsyncs the
  directory, so a reader (or a process resuming after a crash) sees either the old object or the
  whole new one, never a torn write; temporary files are never listed.
- :class:`S3Store`: objects ``<prefix><key>`` in a bucket of any S3-compatible endpoint, through
  boto3 with path-style addressing (an endpoint on 127.0.0.1 or behind a private DNS name has no
  per-bucket host names). S3 PUTs are atomic per object.

Keys are '/'-separated, relative, without empty, '.' or '..' components. Every failure is an
:class:`ObjectStoreError` naming the store, the operation and the key; a missing object is
:class:`ObjectNotFound`. ``delete`` of a missing key succeeds (S3's semantics, kept for both).
"""

import abc
import os
import tempfile
from typing import List

_TMP_PREFIX = ".tmp-"  # DirectoryStore's in-progress writes; never a key component


class ObjectStoreError(RuntimeError):
    """A store operation failed; the message names the store, the operation and the key."""

    def __init__(self, store, op, key, cause):
        super().__init__(f"{store}: {op} {key!r}: {cause}")
        self.store, self.op, self.key = store, op, key


class ObjectNotFound(ObjectStoreError):
    """get_bytes of a key that does not exist."""


def check_key(store, op, key, allow_empty=False):
    """Refuses keys that could escape the store or alias another key (before any I/O)."""
    if not isinstance(key, str):
        raise ObjectStoreError(store, op, key, "key must be a string")
    if key == "" and allow_empty:  # list("") lists everything
        return
    parts = key.split("/")
    if allow_empty and parts[-1] == "":  # a list prefix may end in '/'
        parts = parts[:-1]
    if not parts or any(p in ("", ".", "..") or p.startswith(_TMP_PREFIX) for p in parts) or "\\" in key \
            or "\0" in key:
        raise ObjectStoreError(store, op, key,
                               f"invalid key (relative, '/'-separated, no empty/'.'/'..' parts, none starting "
                               f"with {_TMP_PREFIX!r})")


class ObjectStore(abc.ABC):
    """Bytes under string keys."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Stores ``data`` under ``key`` atomically (replacing any previous object)."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; ObjectNotFound when there is none."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> List[str]:
        """Every key starting with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Removes the object (no error when it does not exist)."""


def _as_bytes(store, key, data):
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ObjectStoreError(store, "put", key, f"data must be bytes, got {type(data).__name__}")
    return bytes(data)


class DirectoryStore(ObjectStore):
    """Objects as files under ``root`` (created if missing)."""

    def __init__(self, root):
        self.root = os.path.abspath(os.fspath(root))
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise ObjectStoreError(self, "open", "", e) from e

    def __repr__(self):
        return f"DirectoryStore({self.root})"

    def _path(self, op, key):
        check_key(self, op, key)
        return os.path.join(self.root, *key.split("/"))

    def put_bytes(self, key, data):
        path = self._path("put", key)
        data = _as_bytes(self, key, data)
        directory = os.path.dirname(path)
        tmp = None
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=directory)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
            # The rename is durable only once the directory entry is.
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise ObjectStoreError(self, "put", key, e) from e
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def get_bytes(self, key):
        path = self._path("get", key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise ObjectNotFound(self, "get", key, "no such object") from e
        except OSError as e:
            raise ObjectStoreError(self, "get", key, e) from e

    def list(self, prefix=""):
        check_key(self, "list", prefix, allow_empty=True)
        keys = []
        try:
            for dirpath, dirnames, filenames in os.walk(self.root):
                rel = os.path.relpath(dirpath, self.root)
                base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
                # Skip subtrees that cannot hold a match (cheap pruning for big roots).
                dirnames[:] = [d for d in dirnames
                               if (base + d + "/").startswith(prefix) or prefix.startswith(base + d + "/")]
                keys += [base + name for name in filenames
                         if not name.startswith(_TMP_PREFIX) and (base + name).startswith(prefix)]
        except OSError as e:
            raise ObjectStoreError(self, "list", prefix, e) from e
        return sorted(keys)

    def delete(self, key):
        path = self._path("delete", key)
        try:
            os.remove(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise ObjectStoreError(self, "delete", key, e) from e
        # Remove directories left empty, so a pruned checkpoint leaves nothing behind.
        directory = os.path.dirname(path)
        while directory != self.root:
            try:
                os.rmdir(directory)
            except OSError:
                break
            directory = os.path.dirname(directory)


class S3Store(ObjectStore):
    """Objects ``<prefix><key>`` in ``bucket`` (which must exist). ``endpoint_url``: any
    S3-compatible endpoint (None: AWS). ``client_options`` go to ``boto3.client("s3", ...)``
    (credentials, region_name, a botocore ``config`` merged over path-style addressing and
    bounded timeouts/retries)."""

    def __init__(self, bucket, prefix="", endpoint_url=None, **client_options):
        import boto3
        import botocore.config

        self.bucket, self.endpoint_url, self.prefix = bucket, endpoint_url, prefix
        if not isinstance(bucket, str) or not bucket:
            raise ObjectStoreError(self, "open", "", "bucket must be a non-empty string")
        prefix = prefix.strip("/")
        if prefix:
            check_key(self, "open", prefix)
        self.prefix = prefix + "/" if prefix else ""
        # Every call gives up within bounded time instead of hanging on a dead endpoint.
        config = botocore.config.Config(s3={"addressing_style": "path"}, connect_timeout=10, read_timeout=60,
                                        retries={"max_attempts": 3, "mode": "standard"})
        if client_options.get("config") is not None:
            config = config.merge(client_options.pop("config"))
        client_options.pop("config", None)
        client_options.setdefault("region_name", "us-east-1")
        self._client = boto3.client("s3", endpoint_url=endpoint_url, config=config, **client_options)
        from botocore.exceptions import BotoCoreError, ClientError
        self._errors = (BotoCoreError, ClientError)

    def __repr__(self):
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Store(s3://{self.bucket}/{self.prefix}{where})"

    def _fail(self, op, key, e):
        code = getattr(e, "response", {}).get("Error", {}).get("Code", "")
        if op == "get" and code in ("NoSuchKey", "404", "NotFound"):
            return ObjectNotFound(self, op, key, "no such object")
        return ObjectStoreError(self, op, key, e)

    def put_bytes(self, key, data):
        check_key(self, "put", key)
        data = _as_bytes(self, key, data)
        try:
            self._client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)
        except self._errors as e:
            raise self._fail("put", key, e) from e

    def get_bytes(self, key):
        check_key(self, "get", key)
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key)
            return response["Body"].read()
        except self._errors as e:
            raise self._fail("get", key, e) from e

    def list(self, prefix=""):
        check_key(self, "list", prefix, allow_empty=True)
        keys = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                          Prefix=self.prefix + prefix)
            for page in pages:
                keys += [obj["Key"][len(self.prefix):] for obj in page.get("Contents", [])]
        except self._errors as e:
            raise self._fail("list", prefix, e) from e
        return sorted(keys)

    def delete(self, key):
        check_key(self, "delete", key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.prefix + key)
        except self._errors as e:
            raise self._fail("delete", key, e) from e

    def close(self):
        """Closes the client's connection pool."""
        self._client.close()
