//! Generates many distinct scoring functions and a lookup table, so the
//! component is ~2 MB with the code/data mix of the repo's Rust plugins
//! (~70% code, ~30% data), for measuring deploy (compile) time.

use std::fmt::Write;

const FUNCTIONS: u32 = 6900;
/// Bytes of the lookup table (read-only data in the component).
const TABLE_BYTES: usize = 560 * 1024;

fn main() {
    let mut code = String::new();
    for i in 0..FUNCTIONS {
        let (a, b, c) = (i.wrapping_mul(2654435761) | 1, i ^ 0x5bd1_e995, i % 31 + 1);
        writeln!(
            code,
            "#[inline(never)] fn score_{i}(v: &[u8]) -> u64 {{ \
               let mut h: u64 = {a}; \
               for (j, &x) in v.iter().enumerate() {{ \
                 h = h.rotate_left({c}) ^ (x as u64).wrapping_mul({b}); \
                 if j % 7 == {m} {{ h = h.wrapping_add({a} ^ j as u64); }} \
                 if h % 13 == {n} {{ h ^= h >> 17; }} else {{ h = h.wrapping_mul(0x9e37_79b9); }} \
               }} \
               match h % 5 {{ 0 => h ^ {b}, 1 => h.wrapping_sub({c}), 2 => h.rotate_right(7), 3 => !h, _ => h }} }}",
            m = i % 7,
            n = i % 13,
        )
        .unwrap();
    }
    code.push_str("static SCORERS: &[fn(&[u8]) -> u64] = &[");
    for i in 0..FUNCTIONS {
        write!(code, "score_{i},").unwrap();
    }
    code.push_str("];\n");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").unwrap()).to_path_buf();
    std::fs::write(out.join("scorers.rs"), code).unwrap();
    // A deterministic pseudo-random table (xorshift).
    let mut x: u32 = 0x9e37_79b9;
    let table: Vec<u8> = (0..TABLE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    std::fs::write(out.join("table.bin"), table).unwrap();
}
