{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "Wlrfl8PX9yaXtHzQ03fX3MAJ1lMT2hPuLGoJuxk8Zf8A+2fvELJOShMymC84/hq4rUa8kC2B0+KOIm+iFJNNAQ=="
}
