"""asr: an end-to-end BFA speech recognizer (BiLSTM encoder, full-attention decoder)."""
