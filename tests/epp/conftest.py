import pytest

from service import epp

if not epp.available():
    pytest.skip("the 'epp' extra (grpcio, grpcio-health-checking, xds-protos) is not installed",
                allow_module_level=True)
