{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "Ghy8DyjUT6BN5NNp+90SE0XOB6xumzNd1hqRWSqyMLmH5jWogIcIuDTtivr2xxk1MJVxRFE0wNf8/jXParIpAA=="
}
