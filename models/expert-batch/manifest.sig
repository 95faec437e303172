{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "f7JtlW8qhxWgM2kTzZP5Ju/PHcrgFi20CTmp3ErvkuIjDqdGnmBuDhbHoYVzfcG02A/e7PMFPQ3Jyapv8jE6Ag=="
}
