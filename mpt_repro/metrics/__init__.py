"""Evaluation metrics that need more than a running sum (detection mAP)."""
