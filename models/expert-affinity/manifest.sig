{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "5DP3jPdXONSizQ+lxvwvL3jWv2CqAok8E/mAB5tNxGfcI5bf0PXvvG12ST87FvCziGCuehNIcMRkeBOevvK6Cg=="
}
