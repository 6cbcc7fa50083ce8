"""`nmt translate`: settings, checkpoint loading, the Translator and its decoding strategies (beam search, sampling, CTranslate2), and input buffering."""
