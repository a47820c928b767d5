//! Lowercase hex digits, for the hashes the crate shows or keys by. Below every layer: any
//! module may use it.

pub(crate) fn encode(bytes: &[u8]) -> String {
    let mut buf = vec![0u8; bytes.len() * 2];
    encode_into(bytes, &mut buf);
    // Hex digits are ASCII.
    buf.into_iter().map(char::from).collect()
}

/// Writes `bytes` as lowercase hex into `out`, which holds exactly twice as many bytes. This
/// is for callers that keep the digits on the stack.
pub(crate) fn encode_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    debug_assert_eq!(out.len(), bytes.len() * 2);
    for (b, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}
