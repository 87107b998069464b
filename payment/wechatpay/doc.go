// Package wechatpay verifies WeChat Pay's API v3 callback notifications
// (支付通知, 退款结果通知) and reads them as payment events, with the
// standard library only. It implements the rules of WeChat Pay's public
// API v3 documentation ("签名验证", "证书和回调报文解密", "支付通知",
// "退款结果通知"):
//
//   - The callback carries Wechatpay-Timestamp (Unix seconds),
//     Wechatpay-Nonce, Wechatpay-Signature (standard base64) and
//     Wechatpay-Serial, the serial of the WeChat Pay platform certificate or
//     the id of the WeChat Pay public key ("PUB_KEY_ID_…") whose private key
//     signed it. Wechatpay-Signature-Type, where sent, must be
//     WECHATPAY2-SHA256-RSA2048.
//   - The signed message is timestamp + "\n" + nonce + "\n" + body + "\n",
//     the body byte for byte as received; the signature is SHA256withRSA,
//     PKCS #1 v1.5.
//   - The timestamp must be within a tolerance of now (the SDKs use 5
//     minutes).
//   - The body is JSON; its resource is encrypted with AEAD_AES_256_GCM
//     under the merchant's APIv3 key: the nonce is resource.nonce's bytes
//     (12), the additional data resource.associated_data's bytes, the
//     ciphertext standard base64 with the 16-byte tag appended.
//
// The signature is checked first, so that unsigned junk of any shape is
// payment.ErrSignature and a stale but genuine callback is payment.ErrStale
// (a signed timestamp is worth trusting only once the signature holds).
// WeChat Pay's probe callbacks, whose signatures start with
// "WECHATPAY/SIGNTEST/", do not verify and are refused, as WeChat Pay expects.
//
// WeChat Pay retries until the answer's status is 200 or 204;
// Verifier.Acknowledge answers 204, Verifier.Refuse a 4xx or 5xx with
// {"code":"FAIL","message":…}.
package wechatpay
