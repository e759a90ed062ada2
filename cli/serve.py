"""``engine-advisor serve`` (the REST service under uvicorn) and ``engine-advisor openapi``."""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

from engine_advisor.cli.errors import CliError
from engine_advisor.service.openapi import DEFAULT_OPENAPI


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the REST service",
                       description="Run the REST service with uvicorn. Options override the "
                                   "ENGINE_ADVISOR_* environment settings; the admin token is "
                                   "read from ENGINE_ADVISOR_ADMIN_TOKEN only.")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--workers", type=int, help="worker processes (default 1)")
    p.add_argument("--model", metavar="PATH",
                   help="model artifact NAME.json (default: embedded model)")
    p.add_argument("--models-dir", metavar="DIR",
                   help="directory whose artifacts POST /v1/model/reload may load")
    p.add_argument("--upstreams", metavar="FILE",
                   help="YAML file of upstream vLLM/SGLang pools: enables the OpenAI-compatible "
                        "proxy (/v1/chat/completions, /v1/completions, /v1/models, /v1/route)")
    p.add_argument("--data-dir", metavar="DIR",
                   help="keep the proxy's observations in DIR/observations.csv across restarts "
                        "and crashes (default: in memory only)")
    p.add_argument("--epp-port", type=int, metavar="PORT",
                   help="also serve the Endpoint Picker for a gateway (Envoy ext_proc over "
                        "gRPC) on this port; needs --upstreams, the 'epp' extra and the "
                        "gateway's authentication: ENGINE_ADVISOR_EPP_TOKEN or mutual TLS")
    p.add_argument("--epp-tls-cert", metavar="FILE",
                   help="the picker's port serves TLS with this PEM certificate chain")
    p.add_argument("--epp-tls-key", metavar="FILE", help="PEM private key of --epp-tls-cert")
    p.add_argument("--epp-tls-client-ca", metavar="FILE",
                   help="mutual TLS: the gateway's client certificate must be signed by this "
                        "PEM CA bundle")
    p.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every request (default off)")
    p.set_defaults(handler=run_serve)

    o = sub.add_parser("openapi", help="write openapi.yaml from the app",
                       description="Regenerate the OpenAPI document of the REST service.")
    o.add_argument("--out", default=str(DEFAULT_OPENAPI), metavar="PATH",
                   help="where to write it (default: openapi.yaml at the repository top)")
    o.set_defaults(handler=run_openapi)


# setting -> (argparse dest, option) of the serve options that override the environment
FLAGS = {"host": ("host", "--host"), "port": ("port", "--port"),
         "workers": ("workers", "--workers"), "model_path": ("model", "--model"),
         "models_dir": ("models_dir", "--models-dir"), "log_level": ("log_level", "--log-level"),
         "upstreams": ("upstreams", "--upstreams"), "epp_port": ("epp_port", "--epp-port"),
         "epp_tls_cert": ("epp_tls_cert", "--epp-tls-cert"),
         "epp_tls_key": ("epp_tls_key", "--epp-tls-key"),
         "epp_tls_client_ca": ("epp_tls_client_ca", "--epp-tls-client-ca"),
         "data_dir": ("data_dir", "--data-dir")}


def _settings(args: argparse.Namespace):
    from pydantic import ValidationError

    from engine_advisor.cli.common import validation_message
    from engine_advisor.service.settings import Settings

    over = {name: getattr(args, dest) for name, (dest, _) in FLAGS.items()
            if getattr(args, dest) is not None}
    try:
        return Settings(**over)
    except ValidationError as exc:
        flags = {name: flag for name, (_, flag) in FLAGS.items()}
        raise CliError(validation_message(exc, flags)) from None


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine_advisor.model.fit.artifact import ArtifactError
    from engine_advisor.service.holder import load_artifact

    settings = _settings(args)
    if settings.model_path is not None:
        try:  # fail here with a clear message rather than in the worker's startup
            load_artifact(settings.model_path)
        except ArtifactError as exc:
            raise CliError(str(exc)) from None
    if settings.models_dir is not None and not settings.models_dir.is_dir():
        raise CliError(f"--models-dir {settings.models_dir}: not a directory")
    if settings.data_dir is not None:
        settings.data_dir = settings.data_dir.resolve()
        try:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CliError(f"--data-dir {settings.data_dir}: cannot create ({exc.strerror})") \
                from None
        if not os.access(settings.data_dir, os.W_OK | os.X_OK):
            raise CliError(f"--data-dir {settings.data_dir}: not writable")
    if settings.upstreams is not None:
        from engine_advisor.service.proxy.upstreams import UpstreamsError, read

        settings.upstreams = settings.upstreams.resolve()
        try:
            read(settings.upstreams)
        except UpstreamsError as exc:
            raise CliError(f"--upstreams: {exc}") from None
    if settings.epp_port is not None:
        from engine_advisor.service import epp

        if settings.upstreams is None:
            raise CliError("--epp-port: needs the upstream pools (--upstreams FILE)")
        if settings.epp_port == settings.port:
            raise CliError(f"--epp-port: {settings.epp_port} is the HTTP port (--port) too")
        if not epp.available():
            raise CliError(epp.MISSING)
        from engine_advisor.service.epp.auth import problem

        for name in ("epp_tls_cert", "epp_tls_key", "epp_tls_client_ca"):
            if getattr(settings, name) is not None:      # workers may start elsewhere
                setattr(settings, name, getattr(settings, name).resolve())
        why = problem(settings)
        if why is not None:
            raise CliError(why)
    # Workers build the app from the environment (uvicorn factory), so pass settings there.
    # (the tokens stay where they came from: ENGINE_ADVISOR_ADMIN_TOKEN, ENGINE_ADVISOR_EPP_TOKEN)
    for name, value in settings.model_dump(exclude={"admin_token", "epp_token"}).items():
        key = f"ENGINE_ADVISOR_{name.upper()}"
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = str(value)
    from engine_advisor.service.transport.protocol import PROTOCOL

    with _picker_counts(settings):
        # uvloop and httptools (dependencies) are what uvicorn's "auto" picks; PROTOCOL is
        # uvicorn's httptools protocol writing each response's head and body at once
        uvicorn.run("engine_advisor.service.main:app_from_env", factory=True, host=settings.host,
                    port=settings.port, workers=settings.workers, log_level=settings.log_level,
                    access_log=args.access_log, server_header=False, loop="auto",
                    http=PROTOCOL)
    return 0


@contextlib.contextmanager
def _picker_counts(settings):
    """With the picker and several workers: the in-flight table they share
    (engine_advisor.service.epp.shared), in a directory of its own, removed when serve exits."""
    if settings.epp_port is None or settings.workers <= 1:
        yield
        return
    import shutil
    import tempfile

    from engine_advisor.service.epp import shared

    shm = Path("/dev/shm")
    folder = Path(tempfile.mkdtemp(prefix="engine-advisor-epp-",
                                   dir=shm if shm.is_dir() else None))
    try:
        shared.create(folder / "in-flight", settings.workers)
        os.environ[shared.ENV] = str(folder / "in-flight")
        yield
    finally:
        os.environ.pop(shared.ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def run_openapi(args: argparse.Namespace) -> int:
    from engine_advisor.model.diskio import atomic_write
    from engine_advisor.service.openapi import openapi_yaml

    atomic_write(Path(args.out), openapi_yaml().encode("utf-8"))
    print(f"wrote {args.out}")
    return 0
