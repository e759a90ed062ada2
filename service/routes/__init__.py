"""The REST API's endpoints: one APIRouter per feature (a "route" is one of these; the proxy's
choice of an upstream is its "routing decision", engine_advisor.service.proxy.decision, which
``POST /v1/route`` in route.py answers without proxying)."""
