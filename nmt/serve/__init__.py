"""`nmt serve`: the HTTP app, its request batcher, its settings and its page."""
