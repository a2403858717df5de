"""`drive bench attention`: NSAC attention against torch's SDPA, time, memory and the cost of S samples
(cost.py)."""
