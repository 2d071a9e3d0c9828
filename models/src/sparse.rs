//! `Sparse<T>`: a part of a record that most records never need, boxed at its first change.
//! Until then it reads as the caller's `none` value, so a record kept for every request in the
//! system (most of them waiting, most never cancelled) holds a pointer instead of the part.
//! The box is made out of line: the path that finds it made stays short.

/// A part boxed at its first change (see the module).
#[derive(Clone, Debug, Default)]
pub struct Sparse<T>(Option<Box<T>>);

impl<T: Default> Sparse<T> {
    /// The part, or `none` (what it reads before its first change) if it has none.
    #[inline(always)]
    pub fn get<'a>(&'a self, none: &'a T) -> &'a T {
        self.0.as_deref().unwrap_or(none)
    }

    /// The part, boxed now (as `T::default()`) if it had none.
    #[inline(always)]
    pub fn get_mut(&mut self) -> &mut T {
        if self.0.is_none() {
            self.0 = first();
        }
        self.0.as_deref_mut().expect("made just now")
    }

    /// The part, if it was made.
    pub fn made(&self) -> Option<&T> {
        self.0.as_deref()
    }

    /// The part, if it ever changed: for a change that does nothing to a fresh part.
    pub fn if_any(&mut self) -> Option<&mut T> {
        self.0.as_deref_mut()
    }

    /// It is made.
    pub fn is_made(&self) -> bool {
        self.0.is_some()
    }

    /// The part goes (its record is done with it).
    pub fn clear(&mut self) {
        self.0 = None;
    }
}

#[cold]
#[inline(never)]
fn first<T: Default>() -> Option<Box<T>> {
    Some(Box::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_none_until_its_first_change_then_its_own() {
        static NONE: u32 = 7;
        let mut s = Sparse::<u32>::default();
        assert_eq!((*s.get(&NONE), s.is_made()), (7, false));
        assert!(s.if_any().is_none());
        *s.get_mut() += 1; // made as the default, 0
        assert_eq!((*s.get(&NONE), s.is_made()), (1, true));
        s.clear();
        assert_eq!(*s.get(&NONE), 7);
    }
}
