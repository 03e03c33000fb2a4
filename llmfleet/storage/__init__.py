"""Copying storage locations (llmfleet.api.storage URIs) to and from local folders.

`fetch(uri, dest)` fills a folder from s3://, hf:// or a local path: resumable (partial files continue where they
stopped), checksummed (S3 ETag and size, Hub file metadata), logged with progress, and safe when several pods
fill one shared folder (a lock; the second finds the copy complete). `upload(folder, uri)` writes a folder to
s3:// or a local path and verifies what arrived.

Floor: imports llmfleet.api only (boto3 and huggingface_hub inside the functions that need them).
"""

from llmfleet.storage.common import FetchError, FetchResult, cache_key
from llmfleet.storage.transfer import cache_base, fetch, local_copy, upload

__all__ = ["FetchError", "FetchResult", "cache_base", "cache_key", "fetch", "local_copy", "upload"]
