"""The Transformer of Section 3: its configuration and named architectures (config), the model in stock torch ops (transformer), and the decoder's state for step-by-step search (incremental)."""
