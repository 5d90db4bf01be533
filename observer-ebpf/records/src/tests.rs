use super::*;

#[test]
fn every_variant_comes_back_from_its_number() {
    for class in PortClass::ALL {
        assert_eq!(PortClass::from_repr(class as u8), Some(class));
    }
    for kind in RecordKind::ALL {
        assert_eq!(RecordKind::from_repr(kind as u8), Some(kind));
    }
    for direction in Direction::ALL {
        assert_eq!(Direction::from_repr(direction as u8), Some(direction));
    }
    for hook in CaptureHook::ALL {
        assert_eq!(CaptureHook::from_repr(hook as u32), Some(hook));
    }
    for state in TcpState::ALL {
        assert_eq!(TcpState::from_repr(state as u32), Some(state));
    }
    assert_eq!(TcpState::from_repr(0), None);
    assert_eq!(TcpState::from_repr(13), None);
    for (index, counter) in Counter::ALL.into_iter().enumerate() {
        // The counters index an array: dense from 0.
        assert_eq!(counter as usize, index);
    }
}

#[test]
fn every_port_has_its_own_bits_of_watched_ports() {
    let mut words = [0u64; WATCHED_PORT_WORDS as usize];
    for port in 0..=u16::MAX {
        let (index, shift) = watched_port_slot(port);
        let bits = 0b11u64 << shift;
        assert_eq!(words[index as usize] & bits, 0, "port {port} shares bits");
        words[index as usize] |= bits;
    }
    assert!(words.iter().all(|word| *word == u64::MAX), "every bit used");
    for (port, class) in [
        (0, PortClass::Grpc),
        (88, PortClass::WebSocket),
        (u16::MAX, PortClass::Grpc),
    ] {
        let (index, shift) = watched_port_slot(port);
        let word = (class as u64) << shift;
        assert_eq!(watched_port_class(word, shift), class as u8);
        let (neighbour_index, neighbour_shift) = watched_port_slot(port ^ 1);
        assert_eq!(neighbour_index, index);
        assert_eq!(watched_port_class(word, neighbour_shift), 0);
    }
}
