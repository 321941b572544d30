"""Training data: conversation formats, regeneration, chat-template masks, vocab map, shards."""
