"""Tenants: API keys -> tenant, and a token bucket per tenant. Keys from config or a mounted Secret file."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import yaml
from pydantic import ValidationError

from llmfleet.router.config import TenantConfig, TenantsConfig

log = logging.getLogger("llmfleet.router.tenants")


@dataclass
class TokenBucket:
    rate: float
    burst: float
    tokens: float
    updated: float

    @classmethod
    def new(cls, rate: float, burst: float | None, now: float) -> TokenBucket:
        b = burst if burst is not None else max(1.0, rate)
        return cls(rate, b, b, now)

    def take(self, now: float, n: float = 1.0) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def retry_after(self) -> float:
        return max(0.0, (1.0 - self.tokens) / self.rate)


class AuthError(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


class Tenants:
    def __init__(self, cfg: TenantsConfig) -> None:
        self.cfg = cfg
        self._mtime: float | None = None
        self._checked = 0.0
        self._by_key: dict[str, TenantConfig] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._tenants: dict[str, TenantConfig] = {}
        self._load(list(cfg.tenants))
        self._reload_file(time.monotonic(), force=True)

    def _load(self, tenants: list[TenantConfig]) -> None:
        self.version = getattr(self, "version", 0) + 1
        self._tenants = {t.name: t for t in tenants}
        self._by_key = {k: t for t in tenants for k in t.api_keys}
        self._buckets = {n: b for n, b in self._buckets.items() if n in self._tenants}

    def _reload_file(self, now: float, force: bool = False) -> None:
        path = self.cfg.file
        if not path or (not force and now - self._checked < 2.0):
            return
        self._checked = now
        try:
            mtime = os.stat(path).st_mtime
        except OSError:
            if force:
                log.warning("tenants file %s not readable: inline tenants only", path)
            return
        if mtime == self._mtime:
            return
        try:
            with open(path) as f:
                doc = yaml.safe_load(f) or {}
            extra = [TenantConfig.model_validate(t) for t in (doc.get("tenants") or [])]
        except (OSError, yaml.YAMLError, ValidationError, AttributeError) as e:
            log.error("tenants file %s invalid, keeping the previous keys: %s", path, e)
            return
        self._mtime = mtime
        self._load([*self.cfg.tenants, *extra])
        log.info("loaded %d tenants from %s", len(extra), path)

    def caps(self) -> dict[str, float]:
        return {n: t.max_degraded_fraction for n, t in self._tenants.items() if t.max_degraded_fraction is not None}

    def authenticate(self, authorization: str | None, now: float | None = None) -> str:
        """Tenant name for the Authorization header; raises AuthError (401 / 429)."""
        now = time.monotonic() if now is None else now
        self._reload_file(now)
        key = None
        if authorization and authorization.lower().startswith("bearer "):
            key = authorization[7:].strip()
        tenant = self._by_key.get(key) if key else None
        if tenant is None:
            if self.cfg.require_api_key:
                raise AuthError(401, "missing or unknown API key" if key is None else "unknown API key")
            tenant = self._tenants.get(self.cfg.default_tenant)
            if tenant is None:
                return self.cfg.default_tenant
        if tenant.requests_per_second is not None:
            b = self._buckets.get(tenant.name)
            if b is None:
                share = self.cfg.limit_share
                burst = None if tenant.burst is None else max(1.0, tenant.burst * share)
                b = self._buckets[tenant.name] = TokenBucket.new(tenant.requests_per_second * share, burst, now)
            if not b.take(now):
                raise AuthError(429, f"rate limit exceeded for tenant {tenant.name}", b.retry_after())
        return tenant.name
