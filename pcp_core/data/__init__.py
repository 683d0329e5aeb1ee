"""Training data: corpora, tokenizers, `pcp data prepare`, manifests, shards and their transfer."""
