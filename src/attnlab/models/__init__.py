"""Models: the encoder-decoder Transformer and the GPT-2 decoder."""
