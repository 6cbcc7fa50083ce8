"""Text and tokens: reading text, tokenizers, Moses processing, binarized token arrays, and the token-count batches of Section 5.1."""
