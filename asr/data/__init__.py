"""Corpus preparation: manifests, offline synthesis, importers, tokenizer, statistics."""
