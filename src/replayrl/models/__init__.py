"""Models at the bottom of the flow: loading (HF folders, hub ids, LoRA), precision, export,
and `replayrl prepare` for offline pretrained weights."""
