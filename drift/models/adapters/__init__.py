"""The bundled architecture families; each module registers its adapters on import
(drift.models.registry imports them all)."""
