//! libgpufence.so — see issue 6.
