{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "V+PkunYh8+I6xmms6P3MhHMGl1a/k1sAuycF4JN12A4DXDOrBONl+x43pfWZ++6IJf/gWGnek6/1XfOiQ65JDw=="
}
