"""`drive monitor ...`: black-box misbehaviour monitors."""
