"""Storage URIs: where models, data and outputs live, and how pods reach them.

One parser (`parse_uri`) and one model (`StorageUri`) for every location field of the API:

- `pvc://claim/path`: a folder on a PersistentVolumeClaim; the operator mounts the claim (subPath) directly.
- `s3://bucket/prefix`: objects under a prefix of an S3-compatible store (endpoint and credentials in
  `spec.storage.s3`); fetched into a cache volume by an init container, uploaded to for outputs.
- `hf://org/name[@revision]`: a Hugging Face Hub repository (token in `spec.storage.hf`); fetched like S3.
- a local path (`/models/x`, `./x`, `file:///models/x`): used in place (`llmfleet up`, `llmfleet train`, or a
  folder baked into an image).
- `tiny://name`: the local runtime's built-in tiny models (`llmfleet model build-tiny`).

Location fields stay strings on the wire (`path: s3://bucket/llama`); their annotated types below check them
when a manifest is parsed, so a bad URI is an error naming its field path.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from llmfleet.api.common import DNS_SUBDOMAIN_PATTERN, ApiModel, CredentialFreeHttpUrl

Scheme = Literal["local", "pvc", "s3", "hf", "tiny"]
REMOTE_SCHEMES: frozenset[str] = frozenset({"s3", "hf"})

# Environment variables a fetching or uploading container reads: boto3's and huggingface_hub's own names, so
# the same variables also configure `llmfleet fetch` run by hand. Secret keys are spelled the same.
S3_ENDPOINT_ENV = "AWS_ENDPOINT_URL"
S3_REGION_ENV = "AWS_DEFAULT_REGION"
S3_ADDRESSING_ENV = "LLMFLEET_S3_ADDRESSING_STYLE"
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
S3_OPTIONAL_SECRET_KEYS = ("AWS_SESSION_TOKEN",)
HF_TOKEN_KEY = "HF_TOKEN"
HF_ENDPOINT_ENV = "HF_ENDPOINT"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_HF_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HF_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")
_TINY = re.compile(r"^[a-z0-9][-a-z0-9]*$")


class StorageUri(BaseModel):
    """A parsed storage location (see the module docstring for the schemes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scheme: Scheme = Field(description="local, pvc, s3, hf or tiny.")
    location: str = Field(
        default="", description="The claim (pvc), bucket (s3), repository id org/name (hf) or model name (tiny); "
        "empty for a local path."
    )
    path: str = Field(
        default="", description="The folder: inside the claim (pvc, no leading slash), the key prefix (s3, no "
        "leading slash), or the local path itself; empty for hf and tiny."
    )
    revision: str | None = Field(default=None, description="Branch, tag or commit of an hf repository.")

    @property
    def is_remote(self) -> bool:
        """Fetched over the network (s3, hf) rather than mounted or used in place."""
        return self.scheme in REMOTE_SCHEMES

    @property
    def name(self) -> str:
        """The last path component: a readable name for the folder a copy goes to."""
        tail = (self.path or self.location).rstrip("/").rsplit("/", 1)[-1]
        return tail or self.location or "root"

    def __str__(self) -> str:
        if self.scheme == "local":
            return self.path
        if self.scheme == "hf":
            return f"hf://{self.location}" + (f"@{self.revision}" if self.revision else "")
        return f"{self.scheme}://{self.location}" + (f"/{self.path}" if self.path else "")


class UriError(ValueError):
    """A string that is not a storage URI the field accepts; the message says what is wrong."""


def _clean_subpath(raw: str, what: str) -> str:
    parts = [p for p in raw.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise UriError(f"{what} may not contain '.' or '..' segments")
    return "/".join(parts)


def parse_uri(raw: str) -> StorageUri:
    """Parse a location string; raises UriError with a one-line reason."""
    text = raw.strip()
    if not text:
        raise UriError("empty location")
    if "://" not in text:
        return StorageUri(scheme="local", path=text)
    scheme, _, rest = text.partition("://")
    if scheme == "file":
        if not rest.startswith("/"):
            raise UriError(f"{raw!r}: file:// URIs need an absolute path (file:///models/x)")
        return StorageUri(scheme="local", path=rest)
    if scheme == "pvc":
        claim, _, sub = rest.partition("/")
        if not _DNS_SUBDOMAIN.match(claim):
            raise UriError(f"{raw!r}: pvc://CLAIM/PATH needs a PersistentVolumeClaim name (DNS-1123), got {claim!r}")
        return StorageUri(scheme="pvc", location=claim, path=_clean_subpath(sub, "the path inside the claim"))
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not _BUCKET.match(bucket) or ".." in bucket:
            raise UriError(f"{raw!r}: s3://BUCKET/PREFIX needs a bucket name (3-63 of a-z 0-9 . -), got {bucket!r}")
        return StorageUri(scheme="s3", location=bucket, path=_clean_subpath(prefix, "the key prefix"))
    if scheme == "hf":
        repo, at, revision = rest.partition("@")
        parts = repo.split("/")
        if not 1 <= len(parts) <= 2 or not all(_HF_PART.match(p) for p in parts):
            raise UriError(f"{raw!r}: hf://ORG/NAME[@REVISION] needs a Hub repository id, got {repo!r}")
        if at and not _HF_REVISION.match(revision):
            raise UriError(f"{raw!r}: bad revision {revision!r} after '@'")
        return StorageUri(scheme="hf", location=repo, revision=revision if at else None)
    if scheme == "tiny":
        if not _TINY.match(rest):
            raise UriError(f"{raw!r}: tiny://NAME names a built-in tiny model")
        return StorageUri(scheme="tiny", location=rest)
    raise UriError(f"{raw!r}: unknown scheme {scheme!r}; use pvc://, s3://, hf://, file:// or a local path")


def _accepting(*schemes: Scheme) -> AfterValidator:
    allowed = ", ".join(f"{s}://" if s != "local" else "a local path" for s in schemes)

    def check(value: str) -> str:
        uri = parse_uri(value)
        if uri.scheme not in schemes:
            raise ValueError(f"{uri.scheme}:// is not accepted here; use {allowed}")
        return value

    return AfterValidator(check)


# A model folder in Hugging Face format: served, distilled from, tokenized with.
ModelUri = Annotated[str, _accepting("local", "pvc", "s3", "hf", "tiny")]
# Training data: token shards with a manifest.json.
DataUri = Annotated[str, _accepting("local", "pvc", "s3")]
# Tokenizers and teacher models: model folders, so tiny:// too (the operator's builders refuse it on a cluster).
SourceUri = Annotated[str, _accepting("local", "pvc", "s3", "hf", "tiny")]
# Where a TrainingJob writes its export: a place the serving pools can read too.
OutputUri = Annotated[str, _accepting("local", "pvc", "s3")]


class S3Storage(ApiModel):
    """How pods reach an S3-compatible object store for s3:// locations."""

    endpoint: CredentialFreeHttpUrl | None = Field(
        default=None, description="Endpoint URL of an S3-compatible store (MinIO, Ceph RGW, "
        "R2, ...); AWS S3 when unset."
    )
    region: str | None = Field(default=None, description="Region; the SDK's default when unset.")
    credentials_secret: str | None = Field(
        default=None, description="Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN "
        "optional); when unset the pod's own identity (IRSA, instance profile) is used."
    )
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="Bucket in the host name (virtual) or in the path (path; most S3-compatible "
        "servers); the SDK decides when auto."
    )


class HFStorage(ApiModel):
    """How pods reach the Hugging Face Hub for hf:// locations."""

    token_secret: str | None = Field(
        default=None, description="Secret with key HF_TOKEN (gated or private repositories); anonymous when unset."
    )
    endpoint: CredentialFreeHttpUrl | None = Field(
        default=None, description="Hub endpoint or mirror URL; huggingface.co when unset."
    )


class CacheSpec(ApiModel):
    """The volume that fetched models and data are written to (once) and read from."""

    claim: str | None = Field(
        default=None, pattern=DNS_SUBDOMAIN_PATTERN,
        description="PersistentVolumeClaim shared by the pods (ReadWriteMany for several nodes): each location is "
        "fetched once into its own folder and later pods find it complete. An emptyDir per pod when unset.",
    )
    size_limit: str = Field(
        default="100Gi", pattern=r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?)?$",
        description="sizeLimit of the per-pod emptyDir (Kubernetes quantity); ignored with a claim.",
    )


class StorageSpec(ApiModel):
    """Connection settings for the s3:// and hf:// locations of this resource, and the cache they land in."""

    s3: S3Storage = Field(default_factory=S3Storage, description="S3-compatible object store.")
    hf: HFStorage = Field(default_factory=HFStorage, description="Hugging Face Hub.")
    cache: CacheSpec = Field(default_factory=CacheSpec, description="Where fetched locations are kept in the pod.")
