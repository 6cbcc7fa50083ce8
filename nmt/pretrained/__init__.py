"""Pretrained models from other toolkits, imported into run directories (`nmt import`)."""
