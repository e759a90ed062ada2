import grpc
import pytest
import yaml

from engine_advisor.service import epp

if not epp.available():
    pytest.skip("the 'epp' extra (grpcio, grpcio-health-checking, xds-protos) is not installed",
                allow_module_level=True)


@pytest.fixture
def picker(tmp_path):
    """``start(pools=None, **settings)``: the app under TestClient serving the picker on a
    free port (the gateway's token set unless given); (app, a Gateway stub, the HTTP client).
    """
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
    from extproc import POOLS, TOKEN, Gateway
    from fastapi.testclient import TestClient
    from proc import free_port

    from engine_advisor.service.main import create_app
    from engine_advisor.service.settings import Settings

    started: list = []

    def start(pools=None, **settings):
        path = tmp_path / "pools.yaml"
        path.write_text(yaml.safe_dump(pools or POOLS))
        port = free_port()
        settings.setdefault("epp_token", TOKEN)
        app = create_app(Settings(upstreams=path, epp_port=port, upstreams_watch_s=0,
                                  **settings))
        client = TestClient(app).__enter__()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        started.append((client, channel))
        app.state.epp_channel = channel
        return app, Gateway(pb_grpc.ExternalProcessorStub(channel)), client

    yield start
    for client, channel in started:
        channel.close()
        client.__exit__(None, None, None)
