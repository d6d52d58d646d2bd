'use strict';
// Preloaded into s3rver (`node --require`, see tests/servers/process.py) to close a race in
// its filesystem store that kills the server: a DELETE removes a directory it has just
// emptied while a PUT into that directory is between its mkdir and its open. The PUT's
// write stream then fails with ENOENT, an 'error' event nothing listens to, and Node exits.
// Here a PUT reads its body first, then writes with ordinary promises and redoes the mkdir
// on ENOENT; the DELETE's clean-up of empty directories stops quietly when one is already
// gone or no longer empty. Everything else is s3rver's own code.

const crypto = require('crypto');
const fs = require('fs-extra');
const path = require('path');
const FilesystemStore = require('s3rver/lib/stores/filesystem');

const ATTEMPTS = 20;

async function readBody(content) {
  if (Buffer.isBuffer(content)) return content;
  const chunks = [];
  for await (const chunk of content) chunks.push(chunk);
  return Buffer.concat(chunks);
}

FilesystemStore.prototype.putObject = async function putObject(object) {
  const body = await readBody(object.content);
  const md5 = crypto.createHash('md5').update(body).digest('hex');
  const objectPath = this.getResourcePath(object.bucket, object.key, 'object');
  for (let attempt = 1; ; attempt++) {
    try {
      await fs.mkdirp(path.dirname(objectPath));
      await fs.writeFile(objectPath, body);
      await this.putMetadata(object.bucket, object.key, object.metadata, md5);
      return { size: body.length, md5 };
    } catch (err) {
      if (err.code !== 'ENOENT' || attempt >= ATTEMPTS) throw err;
    }
  }
};

FilesystemStore.prototype.deleteObject = async function deleteObject(bucket, key) {
  await Promise.all(
    ['object', 'object.md5', 'metadata.json'].map(resource =>
      fs.unlink(this.getResourcePath(bucket, key, resource)).catch(err => {
        if (err.code !== 'ENOENT') throw err;
      }),
    ),
  );
  const bucketPath = this.getBucketPath(bucket);
  const parts = key.split('/');
  parts.pop(); // the last part is in the file's name
  try {
    while (parts.length && !(await fs.readdir(path.join(bucketPath, ...parts))).length) {
      await fs.rmdir(path.join(bucketPath, ...parts));
      parts.pop();
    }
  } catch (err) {
    // Another request removed the directory, or wrote into it, first.
    if (err.code !== 'ENOENT' && err.code !== 'ENOTEMPTY') throw err;
  }
};
