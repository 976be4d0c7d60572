"""The KV tiers: warm slots in RAM, the sidecar files of the disk tier, their format, and the
RAM guard that sizes the slot pool."""
