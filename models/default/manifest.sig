{
  "alg": "ed25519",
  "key_id": "b263fc2956740bc6",
  "signature": "plCbvrud7Ws3tWc8YMlia6QH9idFNpIOzxjB/BgCaLyvka6u9QE/OdTCflf2v26ddMCCxlUkzirxxdGskMMNDg=="
}
