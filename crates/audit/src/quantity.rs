//! Kubernetes resource quantities (`512Mi`, `1G`, `1.5Gi`, `268435456`) in bytes, for comparing
//! a container's memory limit with spillway's memory budget.

/// The bytes `q` stands for, or why it is not a quantity.
pub fn bytes(q: &str) -> Result<u64, String> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{q:?} is not a Kubernetes quantity"))?;
    let scale: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "m" => 1e-3,
        s if s.starts_with(['e', 'E']) => {
            let exp: i32 = s[1..]
                .parse()
                .map_err(|_| format!("{q:?} is not a Kubernetes quantity"))?;
            10f64.powi(exp)
        }
        _ => return Err(format!("{q:?} is not a Kubernetes quantity")),
    };
    let b = n * scale;
    if !(0.0..1.9e19).contains(&b) {
        return Err(format!("{q:?} is not a memory size"));
    }
    Ok(b.ceil() as u64)
}

/// Bytes as a person reads them: `485.7 MiB`.
pub fn show(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes as f64 >= 1024.0 * MIB {
        format!("{:.2} GiB", bytes as f64 / (1024.0 * MIB))
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_read_as_kubernetes_writes_them() {
        assert_eq!(bytes("512Mi"), Ok(512 << 20));
        assert_eq!(bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("268435456"), Ok(268_435_456));
        assert_eq!(bytes("129e6"), Ok(129_000_000));
        assert!(bytes("lots").is_err());
        assert!(bytes("12Qi").is_err());
        assert!(bytes("-1Mi").is_err());
    }
}
