"""The s3 store's seam to obstore: URL parsing, the client, and the one error boundary.

Everything the S3 client can raise becomes a chatstate error here, in
``S3IO._call``, and nowhere else. Transient failures (5xx, SlowDown, dropped
connections, timeouts of reads) are retried by obstore's own retry loop with
exponential backoff and jitter (``RETRY``), so there is exactly one retry
loop; what is left after it is ``StoreUnavailable`` naming the endpoint, the
bucket and the key, and what to do.

Credentials come only from the standard AWS chain (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, web identity, container and
instance credentials; ``AWS_PROFILE`` and ``~/.aws`` through boto3 when it is
installed). A URL carrying credentials is refused, and every message that
leaves this module is scrubbed of the secret values in the environment.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import parse_qs, urlsplit

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from chatstate.core.redact import scrub as scrub
from chatstate.errors import (
    ChatstateError,
    ConfigurationError,
    InvalidStoreURL,
    MissingExtra,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

QUERY_KEYS = ("endpoint_url", "region", "allow_http")
TRUTHY = {"1", "true", "yes", "on"}
RETRY: RetryConfig = {
    "max_retries": 5,
    "backoff": {"init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=2), "base": 2},
    "retry_timeout": timedelta(seconds=30),
}
CLIENT: ClientConfig = {"connect_timeout": "5s", "timeout": "30s", "pool_idle_timeout": "50s"}
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")


class Exists(Exception):
    """Internal: a create-only put found the key taken."""


class Stale(Exception):
    """Internal: an If-Match put found the object changed since we read it."""


@dataclass(frozen=True)
class S3Target:
    """A parsed ``s3://bucket/prefix?endpoint_url=…&region=…&allow_http=true``. No secrets."""

    bucket: str
    prefix: str
    region: str
    endpoint: str | None
    allow_http: bool

    @property
    def endpoint_shown(self) -> str:
        return self.endpoint or f"https://s3.{self.region}.amazonaws.com"

    def where(self, key: str) -> str:
        return f"s3://{self.bucket}/" + "/".join(p for p in (self.prefix, key) if p)


def _bad_url(url: str, why: str) -> NoReturn:
    shown = url.split("?", 1)[0]
    if "@" in shown:  # never echo userinfo back
        shown = "s3://…@" + shown.rsplit("@", 1)[1]
    raise InvalidStoreURL(f"invalid s3 store URL {shown!r}: {why}. The form is s3://bucket/"
                          "prefix?endpoint_url=https://host:port&region=eu-west-1 (add "
                          "allow_http=true for a plain-http local endpoint).")


def parse_url(url: str) -> S3Target:
    """Parse and validate a store URL without any I/O; refuse credentials in it."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        _bad_url(url, "the scheme must be s3://")
    if "@" in parts.netloc:
        _bad_url(url, "credentials do not belong in the URL; set AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment instead")
    bucket = parts.netloc
    if not _BUCKET_RE.fullmatch(bucket):
        _bad_url(url, "the bucket name must be 3-63 lowercase letters, digits, '.' or '-'")
    segments = [s for s in parts.path.split("/") if s]
    if any(s in (".", "..") for s in segments):
        _bad_url(url, "the prefix must not contain '.' or '..' segments")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        _bad_url(url, "the query string is malformed")
    unknown = sorted(set(query) - set(QUERY_KEYS))
    if unknown:
        hint = (" (credentials are read only from the environment, never from the URL)"
                if any("key" in k or "secret" in k or "token" in k for k in unknown) else "")
        _bad_url(url, f"unknown parameter(s) {', '.join(unknown)}; use "
                 f"{', '.join(QUERY_KEYS)}{hint}")
    if any(len(v) > 1 for v in query.values()):
        _bad_url(url, "a parameter is given twice")
    one = {k: v[0] for k, v in query.items()}
    endpoint = (one.get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL") or None)
    if endpoint is not None:
        ep = urlsplit(endpoint)
        if ep.scheme not in ("http", "https") or not ep.netloc or "@" in ep.netloc:
            _bad_url(url, "endpoint_url must be http(s)://host[:port] without credentials")
        endpoint = endpoint.rstrip("/")
    allow_http = one.get("allow_http", "").lower() in TRUTHY
    if endpoint and endpoint.startswith("http://") and not allow_http:
        _bad_url(url, "endpoint_url is plain http: add allow_http=true if that is intended "
                 "(a local test server), otherwise use https")
    region = (one.get("region") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    return S3Target(bucket=bucket, prefix="/".join(segments), region=region,
                    endpoint=endpoint, allow_http=allow_http)


def _credential_provider() -> Any:
    """boto3's chain when a profile or ~/.aws is in play and no keys are in the environment."""
    if os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    profile = os.environ.get("AWS_PROFILE")
    files = [os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"),
             os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")]
    if not profile and not any(Path(f).expanduser().exists() for f in files):
        return None  # obstore's own chain: web identity, container, instance metadata
    try:
        boto3 = importlib.import_module("boto3")
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as exc:
        if profile:
            raise MissingExtra(
                f"AWS_PROFILE={profile} needs boto3 to read ~/.aws ({exc}): pip install "
                "boto3, or export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY instead") from exc
        return None
    return Boto3CredentialProvider(boto3.Session(profile_name=profile))


@dataclass
class Blob:
    data: bytes
    etag: str | None
    modified: datetime | None = None
    """The server's Last-Modified: its clock (whole seconds) when the object was written."""


class S3IO:
    """Thin, typed obstore calls; the one place where client errors are translated."""

    def __init__(self, target: S3Target) -> None:
        from obstore.store import S3Store as Client

        self.target = target
        options: ClientConfig = {**CLIENT, "allow_http": target.allow_http}
        kwargs: dict[str, Any] = {"region": target.region}
        if target.endpoint:
            kwargs["endpoint"] = target.endpoint
        try:
            self.client = Client(target.bucket, prefix=target.prefix or None,
                                 client_options=options, retry_config=RETRY,
                                 credential_provider=_credential_provider(), **kwargs)
        except ChatstateError:
            raise
        except Exception as exc:  # a bad profile, region or endpoint: nothing was sent
            raise ConfigurationError(
                f"could not set up the S3 client for {target.where('')}: {scrub(str(exc))}. "
                "Check AWS_PROFILE and ~/.aws/config (or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY) and the store URL.") from exc

    @contextmanager
    def _call(self, action: str, key: str) -> Iterator[None]:
        where = self.target.where(key)
        endpoint = self.target.endpoint_shown
        try:
            yield
        except (Exists, Stale, ChatstateError):
            raise
        except (PermissionDeniedError, UnauthenticatedError) as exc:
            raise StoreUnavailable(
                f"could not {action} {where} at {endpoint}: access denied ({scrub(str(exc))}). "
                "Check the credentials in the environment (AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the bucket policy.") from exc
        except Exception as exc:  # obstore raises BaseError, OSError, ValueError, RuntimeError
            text = scrub(str(exc))
            if "169.254.169.254" in text and not _credentials_in_env():
                raise StoreUnavailable(
                    f"could not {action} {where}: no AWS credentials were found (none in the "
                    "environment, and no instance metadata service answered). Set "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE).") from exc
            if "NoSuchBucket" in text:
                raise StoreUnavailable(
                    f"could not {action} {where}: bucket {self.target.bucket!r} does not exist "
                    f"at {endpoint}. Create it (aws s3 mb s3://{self.target.bucket}) or fix "
                    "the store URL.") from exc
            raise StoreUnavailable(
                f"could not {action} {where} at {endpoint} (retried with backoff): {text}. "
                "Check that the endpoint is reachable and retry; a write either landed whole "
                "or not at all, and retrying an append never duplicates it.") from exc

    def get(self, key: str, action: str = "read") -> Blob | None:
        """The object's bytes and e-tag, or None when it does not exist."""
        with self._call(action, key):
            try:
                result = obstore.get(self.client, key)
                return Blob(bytes(result.bytes()), result.meta.get("e_tag"),
                            result.meta.get("last_modified"))
            except FileNotFoundError as exc:
                if "NoSuchBucket" in str(exc):
                    raise
                return None

    def put(self, key: str, data: bytes, *, create: bool = False,
            etag: str | None = None, action: str = "write") -> str | None:
        """Write ``data``; ``create`` -> If-None-Match: * (Exists), ``etag`` -> If-Match (Stale)."""
        mode: Any = "create" if create else ({"e_tag": etag} if etag else "overwrite")
        with self._call(action, key):
            try:
                result = obstore.put(self.client, key, data, mode=mode, use_multipart=False)
            except AlreadyExistsError:
                raise Exists(key) from None
            except PreconditionError:
                raise (Exists(key) if create else Stale(key)) from None
            return result.get("e_tag")

    def modified(self, key: str, action: str = "read") -> datetime:
        """The object's Last-Modified (the server's clock when it was written)."""
        with self._call(action, key):
            return obstore.head(self.client, key)["last_modified"]

    def delete(self, keys: Sequence[str], action: str = "delete") -> None:
        """Delete keys (missing ones are fine), in the order given, in batches of 1000."""
        for start in range(0, len(keys), 1000):
            batch = list(keys[start:start + 1000])
            with self._call(action, batch[0]):
                obstore.delete(self.client, batch if len(batch) > 1 else batch[0])

    def keys(self, prefix: str, offset: str | None = None) -> list[tuple[str, Any]]:
        """(key, last_modified) of every object under the path segment ``prefix``, sorted."""
        with self._call("list", prefix + "/"):
            stream = obstore.list(self.client, prefix, offset=offset, chunk_size=1000)
            out = [(o["path"], o["last_modified"]) for chunk in stream for o in chunk]
        return sorted(out)

    def objects(self, prefix: str) -> list[tuple[str, int, Any]]:
        """(key, size, last_modified) of every object under the path segment ``prefix``."""
        with self._call("list", prefix + "/"):
            stream = obstore.list(self.client, prefix, chunk_size=1000)
            return sorted((o["path"], o["size"], o["last_modified"])
                          for chunk in stream for o in chunk)

    def dirs(self, prefix: str) -> list[str]:
        """The names of the 'directories' directly under ``prefix``."""
        with self._call("list", prefix + "/"):
            result = obstore.list_with_delimiter(self.client, prefix)
        return sorted(p.rsplit("/", 1)[-1] for p in result["common_prefixes"])


def _credentials_in_env() -> bool:
    return any(os.environ.get(name) for name in (
        "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"))
