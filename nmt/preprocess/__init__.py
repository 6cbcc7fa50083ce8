"""`nmt preprocess`: cleaning, the vocabulary learned from a sample, binarization in parallel chunks, and a result that appears whole or not at all."""
