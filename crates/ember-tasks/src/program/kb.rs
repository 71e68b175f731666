//! A generated knowledge base of countries, cities and rivers (a small stand-in for the
//! Freebase NSM queries): relations between entities and numeric attributes, all drawn from a
//! seed, so the same seed gives the same world.

use ember_engine::SplitMix64;
use std::collections::{BTreeMap, BTreeSet};

/// The sizes of the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KbSpec {
    /// Countries.
    pub countries: usize,
    /// Cities of each country.
    pub cities_per_country: usize,
    /// Rivers (each through one to three countries).
    pub rivers: usize,
    /// The world's seed (the same for every run seed: the questions and their split follow).
    pub seed: u64,
}

impl Default for KbSpec {
    fn default() -> Self {
        Self {
            countries: 20,
            cities_per_country: 5,
            rivers: 24,
            seed: 0,
        }
    }
}

/// What an entity is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A country.
    Country,
    /// A city.
    City,
    /// A river.
    River,
}

/// The relations, by index.
pub(crate) const COUNTRY: usize = 0;
pub(crate) const CITIES: usize = 1;
pub(crate) const CAPITAL: usize = 2;
pub(crate) const RIVERS: usize = 3;
pub(crate) const COUNTRIES: usize = 4;
const RELATIONS: [&str; 5] = ["country", "cities", "capital", "rivers", "countries"];
/// The attributes, by index.
pub(crate) const POPULATION: usize = 0;
pub(crate) const AREA: usize = 1;
pub(crate) const FOUNDED: usize = 2;
pub(crate) const LENGTH: usize = 3;
const ATTRIBUTES: [&str; 4] = ["population", "area", "founded", "length"];

/// Entities with names and kinds, relations (`(entity, relation)` → entities) and numeric
/// attributes (`(entity, attribute)` → value).
#[derive(Debug, Clone, PartialEq)]
pub struct Kb {
    /// Entity names (capitalised made-up words, distinct).
    pub names: Vec<String>,
    /// Entity kinds.
    pub kinds: Vec<Kind>,
    /// Relation names.
    pub relations: Vec<String>,
    /// Attribute names.
    pub attributes: Vec<String>,
    edges: BTreeMap<(usize, usize), Vec<usize>>,
    values: BTreeMap<(usize, usize), i64>,
}

/// Checks the sizes (each at least one, at most 64 countries and 16 cities each, 64 rivers:
/// the vocabulary holds every name).
///
/// # Errors
/// A message naming the key.
pub fn check_spec(s: &KbSpec) -> Result<(), String> {
    for (key, v, max) in [
        ("countries", s.countries, 64),
        ("cities_per_country", s.cities_per_country, 16),
        ("rivers", s.rivers, 64),
    ] {
        if v == 0 || v > max {
            return Err(format!("kb.{key} = {v} must be in 1..={max}"));
        }
    }
    Ok(())
}

const SYLLABLES: [&str; 24] = [
    "ka", "lo", "mi", "ren", "ta", "vu", "sel", "do", "ni", "bar", "ze", "qua", "mon", "ti", "ga",
    "pel", "ro", "sun", "fa", "dri", "ol", "ve", "cas", "nu",
];

/// `n` distinct names of two or three syllables.
fn names(n: usize, rng: &mut SplitMix64) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = 2 + rng.below(2) as usize;
        let w: String = (0..k)
            .map(|_| SYLLABLES[rng.below(SYLLABLES.len() as u64) as usize])
            .collect();
        let mut c = w.chars();
        let name: String = c
            .next()
            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
            .unwrap_or_default();
        if seen.insert(name.clone()) {
            out.push(name);
        }
    }
    out
}

/// `n` distinct values in `lo..hi` (`hi − lo ≥ n`).
fn distinct(n: usize, (lo, hi): (i64, i64), rng: &mut SplitMix64) -> Vec<i64> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let v = lo + rng.below((hi - lo) as u64) as i64;
        if seen.insert(v) {
            out.push(v);
        }
    }
    out
}

impl Kb {
    /// The world of `spec` (sizes as [`check_spec`] allows).
    pub fn generate(spec: &KbSpec) -> Kb {
        let mut rng = SplitMix64(spec.seed ^ 0x6b62_5f77_6f72_6c64);
        let (nc, per, nr) = (spec.countries, spec.cities_per_country, spec.rivers);
        let mut kb = Kb {
            names: Vec::new(),
            kinds: Vec::new(),
            relations: RELATIONS.iter().map(|s| s.to_string()).collect(),
            attributes: ATTRIBUTES.iter().map(|s| s.to_string()).collect(),
            edges: BTreeMap::new(),
            values: BTreeMap::new(),
        };
        // Each country has 2..=cities_per_country cities (one when that is 1): counts differ.
        let sizes: Vec<usize> = (0..nc)
            .map(|_| per.min(2) + rng.below((per + 1 - per.min(2)) as u64) as usize)
            .collect();
        let n_cities: usize = sizes.iter().sum();
        let pops = distinct(n_cities, (10, 5000), &mut rng);
        let years = distinct(n_cities, (800, 2000), &mut rng);
        let mut cities: Vec<Vec<usize>> = Vec::with_capacity(nc);
        let mut next = nc;
        for (c, size) in sizes.iter().enumerate() {
            let own: Vec<usize> = (next..next + size).collect();
            next += size;
            kb.link(c, CAPITAL, own[rng.below(*size as u64) as usize]);
            for &e in &own {
                kb.link(c, CITIES, e);
                kb.link(e, COUNTRY, c);
                let k = e - nc;
                // Area follows population (density 1–4 per unit), so `argmax area` often
                // answers as `argmax population` does: spurious programs, as on Freebase.
                let density = 1 + rng.below(4) as i64;
                kb.values.insert((e, POPULATION), pops[k]);
                kb.values
                    .insert((e, AREA), pops[k] / density + rng.below(7) as i64);
                kb.values.insert((e, FOUNDED), years[k]);
            }
            cities.push(own);
        }
        let lengths = distinct(nr, (100, 4000), &mut rng);
        for (k, len) in lengths.iter().enumerate() {
            let river = next + k;
            kb.values.insert((river, LENGTH), *len);
            let through = 1 + rng.below(3.min(nc) as u64) as usize;
            for c in rng.permutation(nc).into_iter().take(through) {
                kb.link(river, COUNTRIES, c);
                kb.link(c, RIVERS, river);
                let own = &cities[c];
                for j in rng
                    .permutation(own.len())
                    .into_iter()
                    .take(1 + rng.below(2) as usize)
                {
                    kb.link(own[j], RIVERS, river);
                }
            }
        }
        let n = next + nr;
        kb.names = names(n, &mut rng);
        kb.kinds = (0..n)
            .map(|i| match i {
                _ if i < nc => Kind::Country,
                _ if i < next => Kind::City,
                _ => Kind::River,
            })
            .collect();
        kb
    }

    /// A world with no entities, over these relation and attribute names (a knowledge base
    /// built by hand: [`add`](Self::add), [`link`](Self::link), [`set`](Self::set)).
    pub fn empty(relations: &[&str], attributes: &[&str]) -> Kb {
        Kb {
            names: Vec::new(),
            kinds: Vec::new(),
            relations: relations.iter().map(|s| s.to_string()).collect(),
            attributes: attributes.iter().map(|s| s.to_string()).collect(),
            edges: BTreeMap::new(),
            values: BTreeMap::new(),
        }
    }

    /// Adds an entity; its id.
    pub fn add(&mut self, name: &str, kind: Kind) -> usize {
        self.names.push(name.into());
        self.kinds.push(kind);
        self.names.len() - 1
    }

    /// Sets attribute `at` of `e` to `v`.
    pub fn set(&mut self, e: usize, at: usize, v: i64) {
        self.values.insert((e, at), v);
    }

    /// Adds the edge `from —rel→ to` (once).
    pub fn link(&mut self, from: usize, rel: usize, to: usize) {
        let list = self.edges.entry((from, rel)).or_default();
        if !list.contains(&to) {
            list.push(to);
            list.sort_unstable();
        }
    }

    /// The entities `e` reaches through relation `rel` (empty when none).
    pub fn hop(&self, e: usize, rel: usize) -> Vec<usize> {
        self.edges.get(&(e, rel)).cloned().unwrap_or_default()
    }

    /// Attribute `at` of `e`, if it has one.
    pub fn attr(&self, e: usize, at: usize) -> Option<i64> {
        self.values.get(&(e, at)).copied()
    }

    /// The entities of a kind, in id order.
    pub fn of_kind(&self, k: Kind) -> Vec<usize> {
        (0..self.kinds.len())
            .filter(|e| self.kinds[*e] == k)
            .collect()
    }
}
