"""Building blocks of the decoder models, one file per layer kind."""
