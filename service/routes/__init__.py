"""One APIRouter per feature."""
