"""Black-box misbehaviour monitors of the field, run on the same camera stream as the controllers' own uncertainty.

- `selforacle`: SelfOracle (Stocco et al., ICSE 2020), a VAE's reconstruction error per frame.
- `thirdeye`: ThirdEye (Stocco et al., ASE 2022), the controller's Grad-CAM attention map summarised per frame.

Each gives a per-frame score, higher = more alarming; thresholds and the windows they are judged on belong to the
study (drive/studies/misbehaviour/protocol.py), which imports these modules, never the other way round.
"""
