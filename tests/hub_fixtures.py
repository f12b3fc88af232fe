"""Point the Hugging Face clients at a local HubServer (see tests/hub_server.py).

`configure_hf_env` must run before anything from huggingface_hub, transformers or
datasets is imported (they read these variables at import time), so this module
imports nothing from them at top level.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest


def configure_hf_env(tmp_root: Path) -> int:
    """Set the HF_* variables for a local hub on a free port; returns the port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    tmp_root = Path(tmp_root)
    tmp_root.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
        HF_TOKEN="hf_test_token",
        HF_HUB_DISABLE_XET="1",
        HF_HOME=str(tmp_root / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_UPDATE_DOWNLOAD_COUNTS="0",  # datasets would otherwise ping an S3 download counter on every Hub load
    )
    # Offline switches and cache-location overrides would defeat the fresh HF_HOME.
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE",
                 "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE", "HF_XET_CACHE"):
        os.environ.pop(name, None)
    # Never send loopback traffic through a proxy, should one be configured.
    no_proxy = [host for host in os.environ.get("NO_PROXY", "").split(",") if host]
    for host in ("127.0.0.1", "localhost"):
        if host not in no_proxy:
            no_proxy.append(host)
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = ",".join(no_proxy)
    return port


def endpoint_port() -> int | None:
    """The port of HF_ENDPOINT when it points to 127.0.0.1, else None."""
    endpoint = os.environ.get("HF_ENDPOINT", "")
    prefix = "http://127.0.0.1:"
    if endpoint.startswith(prefix) and endpoint[len(prefix):].rstrip("/").isdigit():
        return int(endpoint[len(prefix):].rstrip("/"))
    return None


@pytest.fixture(scope="session")
def hub_server(tmp_path_factory):
    """A HubServer listening on the port of HF_ENDPOINT (set by configure_hf_env)."""
    try:
        from .hub_server import HubServer
    except ImportError:  # tests/ is not a package: it is on sys.path itself
        from hub_server import HubServer

    port = endpoint_port()
    if port is None:
        pytest.skip("HF_ENDPOINT does not point to 127.0.0.1; call configure_hf_env first")
    server = HubServer(tmp_path_factory.mktemp("hub_storage"), port=port).start()
    yield server
    server.stop()
