// Package alipay verifies Alipay's asynchronous notifications (异步通知,
// notify_type trade_status_sync) of the open platform's trade APIs and reads
// them as payment events, with the standard library only: Alipay publishes
// no Go SDK, and this package implements the rules of Alipay's public
// documentation ("异步通知验签", "自行实现验签").
//
// The rules implemented, in order:
//
//   - The body is application/x-www-form-urlencoded. Every parameter is
//     URL-decoded ('+' is a space), as Alipay's SDKs read the form.
//   - sign_type must be RSA2: SHA256withRSA, PKCS #1 v1.5, with Alipay's
//     public key of the app. The legacy RSA (SHA1withRSA) is refused.
//   - The signed content is every parameter except sign and sign_type,
//     sorted by name in ascending byte order, written name=value and joined
//     by '&'. Parameters whose value is empty are kept ("name="): the
//     documentation names every parameter but sign and sign_type, and
//     Alipay's SDKs (AlipaySignature.getSignCheckContentV1) keep them. The
//     values are the decoded bytes, so a notification whose charset is GBK
//     verifies as GBK bytes without transcoding.
//   - sign is standard base64.
//   - A verified notification must be the merchant's: app_id is the app's
//     APPID (Config.AppID, required) and, where the merchant names one,
//     seller_id its PID (Config.SellerID), as the documentation asks
//     merchants to check; Alipay's public key may be shared by the apps of
//     one account, so the signature alone does not tell them apart.
//
// Only after the signature verifies is anything read: an unsigned body of
// any shape is payment.ErrSignature, a signed one that is not an event is
// payment.ErrMalformed.
//
// Alipay signs no timestamp that could serve as a replay guard: notify_time
// is the notification's time, and a redelivery up to 25 hours later (the
// documented schedule is 4m, 10m, 10m, 1h, 2h, 6h, 15h) must still be
// accepted. So Verify applies no tolerance; replays are answered by the
// idempotency key, notify_id, which the signature covers.
//
// Alipay retries until the answer's body is exactly "success";
// Verifier.Acknowledge writes it, Verifier.Refuse writes "fail".
package alipay
