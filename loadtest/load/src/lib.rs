//! What the load benchmark's binaries share.

use bytes::Bytes;

/// A JSON order of exactly `size` bytes (at least about 300): four items and a padded note.
pub fn order_body(size: usize) -> Bytes {
    let mut items = String::new();
    for i in 0..4 {
        if i > 0 {
            items.push(',');
        }
        items.push_str(&format!(
            r#"{{"sku":"SKU-{:06}-BLUE-M","quantity":{},"price_cents":{}}}"#,
            1000 + i,
            i + 1,
            1999 + i * 100
        ));
    }
    let head = format!(r#"{{"customer":"cust-000042","currency":"EUR","items":[{items}],"note":""#);
    let tail = r#""}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let note: String = "lorem ipsum dolor sit amet "
        .chars()
        .cycle()
        .take(pad)
        .collect();
    Bytes::from(format!("{head}{note}{tail}"))
}
