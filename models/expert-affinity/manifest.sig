{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "R1EUKiehwl8RBttWF6JEjnDlsRrxrKoBbn/ehdNlafaEDIXjFA5Gp/N9czMcw0/FHxJXYY/sJ3lqCBtDFfP2Aw=="
}
