//! What a runtime (and through it a pod) can put on `gpufence nri`'s socket: mux frames carrying
//! ttrpc messages carrying NRI requests. Read as the plugin's reader does — frames (bounded),
//! reassembled per connection, requests decoded and served by the Plugin service with a
//! handler that builds the request as `gpufence nri` does (`nri::request::inputs`): no panic, no answer over ttrpc's limit, a
//! decoder never holding more than one message.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use prost::Message as _;

use gpufence::nri::api::{self, ttrpc as pb};
use gpufence::nri::service::{PLUGIN_SERVICE, Service};
use gpufence::nri::{Gone, Handler, mux, request, ttrpc};

struct Requests;

impl Handler for Requests {
    fn create_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<api::ContainerAdjustment, String> {
        let req = request::inputs(pod, ctr).map_err(|e| e.to_string())?;
        if req.annotations.len() % 2 == 1 {
            return Err(format!("container {}: odd\nreason", ctr.id));
        }
        Ok(api::ContainerAdjustment::default())
    }
    fn container_gone(&self, _id: &str, _why: Gone) {}
}

fuzz_target!(|data: &[u8]| {
    let service = Service::new(Arc::new(Requests));
    let mut decoders = [ttrpc::Decoder::default(), ttrpc::Decoder::default()];
    let mut r = data;
    while let Ok(frame) = mux::read_frame(&mut r) {
        assert!(frame.payload.len() <= mux::MAX_PAYLOAD);
        let d = &mut decoders[(frame.conn & 1) as usize];
        for ev in d.push(&frame.payload) {
            let ttrpc::Event::Message { header, data } = ev else {
                continue;
            };
            assert!(data.len() <= ttrpc::MAX_DATA);
            let Ok(req) = pb::Request::decode(data.as_slice()) else {
                continue;
            };
            // Every method, whatever the service name said.
            let answer = match service.call(PLUGIN_SERVICE, &req.method, &req.payload) {
                Ok(p) => ttrpc::ok_response(header.stream_id, p),
                Err((code, msg)) => ttrpc::error_response(header.stream_id, code, &msg),
            };
            assert!(answer.len() <= ttrpc::HEADER_LEN + ttrpc::MAX_DATA);
        }
    }
});
