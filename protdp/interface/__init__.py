"""Interface confidence per chain pair (ipSAE, ipTM_d0chn, pDockQ, pDockQ2, LIS) as
DunbrackLab/IPSAE's ipsae.py defines it, for protdp's complexes and other tools' files."""
