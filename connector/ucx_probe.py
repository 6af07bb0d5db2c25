"""Ask the UCX that NIXL loads which transports it would use, in this environment.

NIXL's wheels (``nixl_cu12``, ``nixl_cu13``) bundle their own UCX (libucp/libucs/libuct and
transport modules under ``<wheel>.libs/``); a system ``ucx_info`` may be another UCX version
with other transports. This probe opens a UCP context on the bundled UCX itself, with the
``UCX_*`` variables of the calling environment (so ``UCX_TLS``/``UCX_NET_DEVICES`` apply
exactly as in a vLLM server), and prints ``ucp_context_print_info``: the resources
(transport/device) that context uses.

Run it in its own process (a broken UCX must not take the caller down):
``python -m connector.ucx_probe`` prints one JSON object: ``version``, ``library``,
``info`` (the printed context), ``error`` ("" when the context opened).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile
from pathlib import Path

UCP_PARAM_FIELD_FEATURES = 1 << 0
UCP_FEATURE_RMA = 1 << 1
UCP_FEATURE_AM = 1 << 6


def nixl_ucx_dir() -> Path | None:
    """The ``<wheel>.libs`` directory of the NIXL backend ``import nixl`` picks; None if none."""
    import nixl  # noqa: F401  # lazy: nixl (optional, heavy) selects and loads its UCX build

    for name in ("nixl_cu13", "nixl_cu12", "nixl_rocm"):
        module = sys.modules.get(name)
        if module is None or not getattr(module, "__file__", None):
            continue
        libs = Path(module.__file__).resolve().parent.parent / f"{name}.libs"
        if any(libs.glob("libucp*.so*")):
            return libs
    return None


def _lib(libdir: Path, stem: str) -> ctypes.CDLL:
    path = sorted(libdir.glob(f"{stem}-*.so*")) or sorted(libdir.glob(f"{stem}.so*"))
    if not path:
        raise OSError(f"no {stem} in {libdir}")
    return ctypes.CDLL(str(path[0]), mode=ctypes.RTLD_GLOBAL)


def probe(libdir: Path) -> dict[str, str]:
    """Open and describe one UCP context (RMA + AM, what NIXL asks for) on ``libdir``'s UCX."""
    _lib(libdir, "libucs")
    _lib(libdir, "libuct")
    ucp = _lib(libdir, "libucp")
    ucp.ucp_get_version_string.restype = ctypes.c_char_p
    version = ucp.ucp_get_version_string().decode()
    major, minor, release = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
    ucp.ucp_get_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(release))
    out = {"version": version, "library": str(libdir), "info": "", "error": ""}
    for name in ("ucp_config_read", "ucp_init_version"):
        getattr(ucp, name).restype = ctypes.c_int8  # ucs_status_t is a packed enum
    config = ctypes.c_void_p()
    status = ucp.ucp_config_read(None, None, ctypes.byref(config))
    if status != 0:
        out["error"] = f"ucp_config_read failed (status {status}): check the UCX_* variables"
        return out
    params = (ctypes.c_uint64 * 64)()  # ucp_params_t, zeroed; only field_mask + features set
    params[0] = UCP_PARAM_FIELD_FEATURES
    params[1] = UCP_FEATURE_RMA | UCP_FEATURE_AM
    context = ctypes.c_void_p()
    ucp.ucp_init_version.argtypes = [ctypes.c_uint] * 2 + [ctypes.c_void_p] * 3
    status = ucp.ucp_init_version(major.value, minor.value, params, config, ctypes.byref(context))
    if status != 0 or not context.value:
        out["error"] = (
            f"ucp_init failed (status {status}): UCX found no usable transport for the "
            "UCX_TLS/UCX_NET_DEVICES of this environment"
        )
        return out
    ucp.ucp_config_release(config)
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    ucp.ucp_context_print_info.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    ucp.ucp_cleanup.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r", suffix=".ucp") as sink:
        stream = libc.fopen(sink.name.encode(), b"w")
        ucp.ucp_context_print_info(context, stream)
        libc.fclose(stream)
        out["info"] = Path(sink.name).read_text()
    ucp.ucp_cleanup(context)
    return out


def main() -> int:
    try:
        libdir = nixl_ucx_dir()
    except ImportError as err:
        print(json.dumps({"version": "", "library": "", "info": "", "error": f"nixl: {err}"}))
        return 1
    if libdir is None:
        result = {"version": "", "library": "", "info": "", "error": "nixl bundles no UCX"}
    else:
        try:
            result = probe(libdir)
        except OSError as err:
            result = {"version": "", "library": str(libdir), "info": "", "error": str(err)}
    print(json.dumps(result), flush=True)
    return 0 if not result["error"] else 1


if __name__ == "__main__":
    # Leave without running library destructors: a UCX whose context failed to open can
    # crash in them at exit, after the answer is out.
    os._exit(main())
