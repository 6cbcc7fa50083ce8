"""`nmt export`: a run's model in another engine's format (CTranslate2)."""
