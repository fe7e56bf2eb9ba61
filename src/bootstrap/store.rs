//! The key-value store rendezvous runs over. In production it is torch's
//! store (wrapped in `py`), in tests an in-memory one.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A store shared by all ranks of a group: `get` blocks until the key is set.
pub trait Store: Send + Sync {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String>;
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String>;
    /// Adds `delta` to an integer key (created at 0) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, String>;
}

/// In-process store for tests (threads as ranks).
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.map.lock().map_err(|_| "store poisoned")?.insert(key.to_string(), value.to_vec());
        self.cv.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String> {
        let deadline = Instant::now() + timeout;
        let mut map = self.map.lock().map_err(|_| "store poisoned")?;
        loop {
            if let Some(v) = map.get(key) {
                return Ok(v.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!("Timed out waiting for key {key:?}"));
            }
            map = self.cv.wait_timeout(map, deadline - now).map_err(|_| "store poisoned")?.0;
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, String> {
        let mut map = self.map.lock().map_err(|_| "store poisoned")?;
        let cur = map.get(key).map(|v| String::from_utf8_lossy(v).parse::<i64>().unwrap_or(0)).unwrap_or(0);
        let new = cur + delta;
        map.insert(key.to_string(), new.to_string().into_bytes());
        self.cv.notify_all();
        Ok(new)
    }
}
