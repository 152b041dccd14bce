//! NPB FT problem classes and their reference checksums.

use std::fmt;
use std::str::FromStr;

/// An NPB FT problem class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Class {
    /// 64 × 64 × 64, 6 iterations.
    S,
    /// 128 × 128 × 32, 6 iterations.
    W,
    /// 256 × 256 × 128, 6 iterations.
    A,
    /// 512 × 256 × 256, 20 iterations.
    B,
    /// 512 × 512 × 512, 20 iterations.
    C,
}

impl Class {
    /// Every class, smallest first.
    pub const ALL: [Class; 5] = [Class::S, Class::W, Class::A, Class::B, Class::C];

    /// Grid size (nx, ny, nz); x varies fastest.
    pub fn dims(self) -> [usize; 3] {
        match self {
            Class::S => [64, 64, 64],
            Class::W => [128, 128, 32],
            Class::A => [256, 256, 128],
            Class::B => [512, 256, 256],
            Class::C => [512, 512, 512],
        }
    }
    /// Number of time steps.
    pub fn iterations(self) -> usize {
        match self {
            Class::S | Class::W | Class::A => 6,
            Class::B | Class::C => 20,
        }
    }
    /// Grid points.
    pub fn points(self) -> usize {
        self.dims().iter().product()
    }
    /// The reference checksums (one per iteration) from NPB, where this build has them.
    pub fn reference(self) -> Option<Vec<[f64; 2]>> {
        parse_references(REFERENCES).into_iter().find(|(c, _)| *c == self).map(|(_, v)| v)
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

impl FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Class::ALL
            .into_iter()
            .find(|c| c.to_string().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown class {s:?} (expected one of S, W, A, B, C)"))
    }
}

/// NPB's published per-iteration checksums (`data/checksums.txt`: S, W and A from the
/// project's shared data, B and C from NPB's own verify routine).
const REFERENCES: &str = include_str!("../data/checksums.txt");

/// Parses `class X ...` headers followed by `iteration real imaginary` lines.
pub fn parse_references(text: &str) -> Vec<(Class, Vec<[f64; 2]>)> {
    let mut out: Vec<(Class, Vec<[f64; 2]>)> = vec![];
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words[0] == "class" {
            if let Some(c) = words.get(1).and_then(|w| w.parse().ok()) {
                out.push((c, vec![]));
            }
        } else if let (Some(last), [_, re, im]) = (out.last_mut(), words.as_slice()) {
            if let (Ok(re), Ok(im)) = (re.parse(), im.parse()) {
                last.1.push([re, im]);
            }
        }
    }
    out
}

/// NPB's verification rule: |(checksum − reference) / reference| ≤ 1e-12 (complex).
pub const EPSILON: f64 = 1e-12;

/// Whether `got` matches `want` by NPB's rule ([`EPSILON`]).
pub fn matches(got: [f64; 2], want: [f64; 2]) -> bool {
    let (g, w) = (num_complex::Complex::new(got[0], got[1]), num_complex::Complex::new(want[0], want[1]));
    ((g - w) / w).norm() <= EPSILON
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_for_every_class() {
        for c in Class::ALL {
            let r = c.reference().expect("reference");
            assert_eq!(r.len(), c.iterations(), "class {c}");
        }
        assert_eq!(Class::B.reference().map(|r| r.len()), Some(20));
        assert_eq!(Class::C.reference().map(|r| r.len()), Some(20));
        assert_eq!(Class::S.reference().unwrap()[0], [5.546087004964e+02, 4.845363331978e+02]);
    }

    #[test]
    fn parse_class_names() {
        assert_eq!("b".parse::<Class>(), Ok(Class::B));
        assert!("D".parse::<Class>().is_err());
    }

    #[test]
    fn tolerance() {
        let r = [554.6087004964, 484.5363331978];
        assert!(matches(r, r));
        assert!(matches([r[0] * (1.0 + 5e-13), r[1]], r));
        assert!(!matches([r[0] * (1.0 + 5e-12), r[1]], r));
    }
}
