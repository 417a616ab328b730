"""Checkpoint reading and sanity: a checkpoint's files and config.json (files), the safetensors
header parser (safetensors_header), every tensor from headers only (headers), limits on
untrusted input, the config as transformers reads it (configview), the cross-check with the
model class (match), model building (modeling) and whether the weights themselves are broken
(header_sanity, sanity)."""
