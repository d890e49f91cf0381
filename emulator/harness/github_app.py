"""A throwaway GitHub App for tests: its RSA key pair, its ids, and an App JWT signed as the client signs one."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

APP_ID = 4242
INSTALLATION_ID = 77
OWNER = "octo-org"
REPO = "app"


@dataclass(frozen=True)
class AppKey:
    private_pem: str = field(repr=False)
    public_pem: str


def generate_app_key() -> AppKey:
    """A fresh 2048-bit RSA key, the size GitHub issues App keys in."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # what GitHub's downloaded .pem holds
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return AppKey(private_pem, public_pem)


@functools.cache
def app_key(index: int = 0) -> AppKey:
    """The process's `index`-th App key, made once: generating an RSA key is the slow part of a fake
    GitHub (about 30 ms). The Apps of one world take indexes 0, 1, ..., so each has a key of its own."""
    return generate_app_key()


def app_jwt(key: AppKey, now: float, *, issuer: int | str = APP_ID, lifetime: int = 540) -> str:
    issued_at = int(now) - 60
    claims = {"iat": issued_at, "exp": issued_at + lifetime, "iss": str(issuer)}
    return jwt.encode(claims, key.private_pem, algorithm="RS256")
