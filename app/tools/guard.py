"""Where an `http` tool may send a request: the allowlist and the always-forbidden addresses.

Loopback and private ranges are allowed (tests and on-prem tools live there); link-local, cloud
metadata, multicast, unspecified and reserved addresses never are, whatever the allowlist says.
"""

from __future__ import annotations

import asyncio
import socket
from ipaddress import IPv4Address, IPv6Address, ip_address, ip_network
from urllib.parse import urlsplit

from app.domain.failures import ErrorClass, Failure, FailureError

IPAddress = IPv4Address | IPv6Address

# The metadata services of AWS (v4 and v6), GCP/Azure (169.254.169.254) and Alibaba Cloud.
# fd00:ec2::254 and 100.100.100.200 sit in ranges that are otherwise allowed.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ip_network("64:ff9b::/96")

REFUSED_MESSAGE = "destination not allowed"


def normalize_host(host: str) -> str:
    """A hostname as the allowlist compares it: lower case, no trailing dot."""
    return host.strip().lower().rstrip(".")


def forbidden_address(address: IPAddress) -> bool:
    """Whether a request must never reach `address`."""
    address = _embedded_ipv4(address) or address
    if address in METADATA_ADDRESSES:
        return True
    if address.is_loopback:
        # ::1 is inside ::/8, which ipaddress calls reserved; loopback is allowed on purpose.
        return False
    return (
        address.is_link_local
        or address.is_multicast
        or address.is_unspecified
        or address.is_reserved
    )


def _embedded_ipv4(address: IPAddress) -> IPv4Address | None:
    # An IPv6 form that carries an IPv4 address reaches that IPv4 host: judge the host.
    if not isinstance(address, IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64:
        return IPv4Address(int(address) & 0xFFFFFFFF)
    return None


async def check_url(url: str, allowlist: frozenset[str]) -> None:
    """Raise FailureError unless `url` may be called: allowlisted host, no forbidden address."""
    parts = urlsplit(url)
    host = parts.hostname
    try:
        port = parts.port
    except ValueError:
        raise _refused() from None
    if parts.scheme not in ("http", "https") or not host:
        raise _refused()
    host = normalize_host(host)
    if allowlist and host not in {normalize_host(h) for h in allowlist}:
        raise _refused()
    for address in await _resolve(host, port or (443 if parts.scheme == "https" else 80)):
        if forbidden_address(address):
            raise _refused()


async def _resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to; a literal address is taken as written."""
    try:
        return [ip_address(host)]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except UnicodeError:  # not encodable as IDNA: no such host can exist
        raise _refused() from None
    except OSError:  # socket.gaierror and friends
        raise FailureError(
            Failure.of(ErrorClass.TOOL_UNAVAILABLE, "could not resolve the tool's host")
        ) from None
    addresses = [ip_address(str(info[4][0])) for info in infos]
    if not addresses:
        raise FailureError(
            Failure.of(ErrorClass.TOOL_UNAVAILABLE, "could not resolve the tool's host")
        )
    return addresses


def _refused() -> FailureError:
    # Never name the host: the message reaches the model and the client.
    return FailureError(Failure.of(ErrorClass.TOOL_FAILED, REFUSED_MESSAGE))
