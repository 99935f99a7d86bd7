"""The build: plan (candidates, buckets), steps (measure, cross-evaluate, partition, write),
the partition (set cover + DP regions + the pick rule's gate) and the per-signature checkpoint.
pipeline.py writes their order down; nothing here imports a concrete kernel family."""
